print('Now run this command:')
print()
print('echo', 33 * 27, '> answer.txt')
